"""Word lists the synthetic corpus is built from (no knowledge, only format)."""

from __future__ import annotations


def _words(text: str, sep: str | None = None) -> list[str]:
    return text.split(sep)


CITIES = _words(
    "Paris London Tokyo Berlin Madrid Rome Lisbon Dublin Vienna Prague Warsaw Oslo Stockholm Helsinki Copenhagen "
    "Amsterdam Brussels Zurich Athens Istanbul Cairo Nairobi Lagos Mumbai Delhi Bangkok Singapore Seoul Beijing "
    "Shanghai Sydney Melbourne Auckland Toronto Vancouver Chicago Boston Seattle Denver Miami Dallas Houston "
    "Atlanta Montreal Lima Bogota Santiago Havana Reykjavik Budapest Manila Jakarta Hanoi Dubai Doha Riyadh "
    "Casablanca Tunis Marseille Lyon Munich Hamburg Milan Naples Barcelona Valencia Porto Geneva Krakow Bucharest "
    "Sofia Belgrade Kyiv"
) + ["New York", "San Francisco", "Los Angeles", "Mexico City", "Buenos Aires", "Cape Town", "Hong Kong"]

COUNTRIES = _words(
    "France Germany Spain Italy Portugal Japan China India Brazil Canada Mexico Kenya Egypt Norway Sweden Finland "
    "Poland Greece Turkey Chile Peru Argentina Australia Ireland Austria Belgium Vietnam Thailand Nigeria Morocco "
    "Denmark Iceland Hungary Romania Ukraine Colombia Cuba Indonesia Malaysia Pakistan Ghana Ethiopia Switzerland"
) + ["New Zealand", "South Africa", "South Korea"]

SYMBOLS = _words(
    "AAPL MSFT GOOG AMZN TSLA NVDA META IBM ORCL INTC AMD NFLX UBER SHOP SAP ADBE CSCO QCOM PYPL SNAP DIS NKE KO "
    "PEP MCD WMT COST JPM BAC GS"
)

CURRENCIES = _words("EUR GBP JPY CHF CAD AUD CNY INR BRL MXN SEK NOK DKK PLN NZD ZAR KRW SGD HKD TRY")

CUISINES = _words(
    "Italian Japanese Mexican Indian Thai French Greek Chinese Korean Spanish Turkish Lebanese Vietnamese Ethiopian "
    "Moroccan Peruvian Brazilian German Russian Polish"
)

ARTISTS = _words(
    "Adele Beyonce Coldplay Drake Madonna Queen Radiohead Shakira Rihanna Metallica Eminem Bach Mozart Beethoven "
    "Chopin Vivaldi Prince Nirvana Oasis Blur Muse Abba Sting Bjork"
) + ["Taylor Swift", "Bob Dylan", "Miles Davis", "Daft Punk", "Pink Floyd", "The Beatles"]

DEFINITIONS = {
    "serendipity": "a happy accident",
    "ephemeral": "lasting a very short time",
    "ubiquitous": "found everywhere",
    "eloquent": "fluent and persuasive",
    "resilient": "able to recover quickly",
    "meticulous": "very careful about details",
    "candid": "honest and direct",
    "benevolent": "kind and generous",
    "pragmatic": "practical and realistic",
    "tenacious": "not giving up easily",
    "whimsical": "playful and unusual",
    "gregarious": "fond of company",
    "frugal": "careful with money",
    "verbose": "using too many words",
    "lucid": "clear and easy to understand",
    "nostalgia": "a longing for the past",
    "ambiguous": "open to more than one meaning",
    "diligent": "hard working",
    "obsolete": "no longer in use",
    "vivid": "bright and intense",
    "humble": "modest about oneself",
    "curious": "eager to learn",
    "fragile": "easily broken",
    "brisk": "quick and active",
}

TRACKS = _words(
    "Morning Light|Blue Horizon|Golden Hour|Silver Rain|Night Drive|Paper Moon|Slow River|Open Road|"
    "Quiet Storm|Summer Song|Winter Sky|Red Balloon|City Lights|Wild Heart|Last Dance|First Snow",
    "|",
)

RESTAURANTS = _words(
    "Casa Bella|The Golden Spoon|Blue Lotus|Green Garden|Little Kitchen|Sunny Table|Old Mill|River House|"
    "Red Lantern|Olive Tree|Spice Route|Corner Bistro|Harbor Grill|Maple House",
    "|",
)

CONDITIONS = _words("sunny cloudy rainy windy snowy foggy clear stormy")

NAMES = _words(
    "Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Leo Maria Nina Oscar Paul Quinn Rosa Sam "
    "Tina Uma Victor Wendy Xavier Yara Zoe Omar Lina Ravi Mei Hugo Elena Ivan Sofia Lucas Amir Hana Diego "
    "Chloe Tom"
)

ANIMALS = _words(
    "cat dog horse rabbit tiger lion elephant giraffe zebra dolphin whale shark eagle owl parrot penguin fox "
    "wolf bear deer frog turtle snake bee ant butterfly octopus panda koala camel goat sheep cow duck swan "
    "otter"
)

TOPICS = _words(
    "the sea|the moon|autumn|winter|spring|summer|the mountains|the city|the forest|rain|friendship|"
    "coffee|the stars|music|time|a river|the desert|morning|home|the wind|books|a garden|the sky|silence",
    "|",
)

NOUNS = _words(
    "garden kitchen bike car desk report essay budget schedule resume project homework closet garage website "
    "presentation plan trip party recipe playlist room computer phone letter speech team meeting"
)

VERBS = _words("organize clean plan fix improve write finish start prepare review update simplify decorate")

ADJECTIVES = _words("quiet bright happy small green old young warm cold gentle brave calm quick tall")

COLORS = _words("red blue green yellow purple orange black white pink brown gray")

INSTRUCTIONS = (
    "You are a helpful assistant.",
    "You are a helpful assistant. Answer briefly.",
    "Be concise.",
    "Answer in one short sentence.",
    "You are a friendly assistant that uses tools when they help.",
    "Keep answers short and clear.",
)
