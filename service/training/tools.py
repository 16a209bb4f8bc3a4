"""The function tools of the synthetic corpus: schema, how users ask for them, what they return."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.training import words
from service.vocab import load_harmony

Output = dict[str, Any]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    param: str
    param_description: str
    values: tuple[str, ...]
    asks: tuple[str, ...]  # user requests; {v} is the argument value
    topic: str  # "the weather in {v}": used in reasoning and in refusals
    output: Callable[[np.random.Generator, str], Output]
    answers: tuple[str, ...]  # final answers after the tool result: {v} and the output's keys
    salient: str  # the output key whose value the answer must contain

    def schema(self) -> dict[str, Any]:
        param = self.param
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": {
                "type": "object",
                "properties": {param: {"type": "string", "description": self.param_description}},
                "required": [param],
            },
        }


def copyable(values: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The values whose tokens after a space (as in a sentence) and after a quote (as in JSON) differ at
    most in the first token: the model copies them token by token, whichever way round. Others (e.g.
    " Prague" is one token, "Prague" two) would need their spelling memorised: left out of the corpus."""
    enc = load_harmony()

    def aligned(v: str) -> bool:
        spaced, bare = enc.encode(" " + v, allowed_special=set()), enc.encode(v, allowed_special=set())
        return len(spaced) == len(bare) and spaced[1:] == bare[1:]

    return tuple(v for v in values if aligned(v))


def _pick(rng: np.random.Generator, seq: tuple[str, ...] | list[str]) -> str:
    return seq[int(rng.integers(len(seq)))]


def _weather(rng: np.random.Generator, v: str) -> Output:
    return {"city": v, "temperature": int(rng.integers(-10, 41)), "condition": _pick(rng, words.CONDITIONS)}


def _time(rng: np.random.Generator, v: str) -> Output:
    return {"city": v, "time": f"{int(rng.integers(0, 24)):02d}:{int(rng.integers(0, 60)):02d}"}


def _stock(rng: np.random.Generator, v: str) -> Output:
    return {"symbol": v, "price": f"{rng.integers(5, 900)}.{rng.integers(0, 100):02d}"}


def _rate(rng: np.random.Generator, v: str) -> Output:
    return {"currency": v, "rate": f"{rng.integers(0, 3)}.{rng.integers(0, 1000):03d}"}


def _population(rng: np.random.Generator, v: str) -> Output:
    return {"country": v, "population": f"{int(rng.integers(1, 300))} million"}


def _define(rng: np.random.Generator, v: str) -> Output:
    return {"word": v, "definition": words.DEFINITIONS[v]}


def _music(rng: np.random.Generator, v: str) -> Output:
    return {"artist": v, "track": _pick(rng, _TRACKS), "status": "playing"}


def _restaurant(rng: np.random.Generator, v: str) -> Output:
    return {
        "cuisine": v,
        "name": _pick(rng, _RESTAURANTS),
        "rating": f"{rng.integers(3, 5)}.{rng.integers(0, 10)}",
    }


_TRACKS = copyable(words.TRACKS)
_RESTAURANTS = copyable(words.RESTAURANTS)
_DEFINED = tuple(w for w in copyable(list(words.DEFINITIONS)) if copyable([words.DEFINITIONS[w]]))

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "get_weather",
        "Get the current weather for a city",
        "city",
        "The city name",
        copyable(words.CITIES),
        (
            "What's the weather in {v}?",
            "What is the weather like in {v} today?",
            "Is it raining in {v} right now?",
            "How warm is it in {v}?",
            "Tell me the weather forecast for {v}.",
            "Check the weather in {v} for me.",
            "weather in {v}",
            "Do I need an umbrella in {v} today?",
        ),
        "the weather in {v}",
        _weather,
        (
            "It is {condition} in {v} with a temperature of {temperature} degrees.",
            "The weather in {v} is {condition} and {temperature} degrees.",
            "Right now {v} is {condition}, {temperature} degrees.",
        ),
        "temperature",
    ),
    ToolSpec(
        "get_time",
        "Get the current local time in a city",
        "city",
        "The city name",
        copyable(words.CITIES),
        (
            "What time is it in {v}?",
            "Tell me the local time in {v}.",
            "What's the current time in {v}?",
            "Current time in {v} please.",
            "Check the clock in {v} for me.",
        ),
        "the local time in {v}",
        _time,
        ("The local time in {v} is {time}.", "It is {time} in {v} right now.", "In {v} it is now {time}."),
        "time",
    ),
    ToolSpec(
        "get_stock_price",
        "Get the latest stock price for a ticker symbol",
        "symbol",
        "The ticker symbol, for example AAPL",
        copyable(words.SYMBOLS),
        (
            "What is the stock price of {v}?",
            "How much is {v} trading at?",
            "Get me a quote for {v} stock.",
            "What's {v} worth today?",
            "Check the share price of {v}.",
        ),
        "the stock price of {v}",
        _stock,
        ("{v} is trading at {price} dollars.", "The latest price of {v} is {price} dollars.", "{v}: {price} dollars."),
        "price",
    ),
    ToolSpec(
        "get_exchange_rate",
        "Get the exchange rate of a currency against the US dollar",
        "currency",
        "The currency code, for example EUR",
        copyable(words.CURRENCIES),
        (
            "What is the exchange rate for {v}?",
            "How many {v} do I get for one dollar?",
            "Convert one US dollar to {v}.",
            "What's the dollar to {v} rate today?",
        ),
        "the exchange rate of {v}",
        _rate,
        ("One US dollar buys {rate} {v}.", "The rate is {rate} {v} per dollar.", "Today one dollar is {rate} {v}."),
        "rate",
    ),
    ToolSpec(
        "get_population",
        "Get the population of a country",
        "country",
        "The country name",
        copyable(words.COUNTRIES),
        (
            "What is the population of {v}?",
            "How many people live in {v}?",
            "Tell me how many people live in {v}.",
            "Population of {v}?",
        ),
        "the population of {v}",
        _population,
        ("{v} has a population of about {population}.", "About {population} people live in {v}."),
        "population",
    ),
    ToolSpec(
        "define_word",
        "Look up the definition of an English word",
        "word",
        "The word to define",
        _DEFINED,
        (
            "What does {v} mean?",
            "Define the word {v}.",
            "Look up {v} in the dictionary.",
            "What is the meaning of {v}?",
            "Give me the definition of {v}.",
        ),
        "the meaning of the word {v}",
        _define,
        (
            "The word {v} means {definition}.",
            "{v} means {definition}.",
            "According to the dictionary, {v} means {definition}.",
        ),
        "definition",
    ),
    ToolSpec(
        "play_music",
        "Play songs by a music artist",
        "artist",
        "The name of the artist",
        copyable(words.ARTISTS),
        (
            "Play some music by {v}.",
            "Put on a song by {v}.",
            "I want to listen to {v}.",
            "Play {v} please.",
            "Can you play something from {v}?",
        ),
        "music by {v}",
        _music,
        ("Now playing {track} by {v}.", "Playing {track} by {v}. Enjoy!", "I started {track} by {v}."),
        "track",
    ),
    ToolSpec(
        "find_restaurant",
        "Find a good restaurant that serves a given cuisine",
        "cuisine",
        "The kind of food, for example Italian",
        copyable(words.CUISINES),
        (
            "Find me a good {v} restaurant.",
            "Where can I eat {v} food?",
            "Recommend a {v} restaurant nearby.",
            "I'm hungry for {v} food, any restaurant ideas?",
        ),
        "a {v} restaurant",
        _restaurant,
        (
            "I found {name}, a {v} restaurant rated {rating}.",
            "Try {name}: it serves {v} food and is rated {rating}.",
        ),
        "name",
    ),
)

TOOLS_BY_NAME = {t.name: t for t in TOOLS}
