"""Chat turns no tool serves: greetings, small questions, repeats, poems, counting, unclear requests."""

from __future__ import annotations

import numpy as np

from service.training import words
from service.training.sample import pick


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def chat_turn(rng: np.random.Generator) -> tuple[str, list[str], str]:
    """A request no tool serves: (user text, reasoning sentences, final answer)."""
    kind = int(rng.integers(11))
    if kind == 0:
        user = pick(rng, ["Hello", "Hi", "Hi there!", "Hey", "Good morning", "Say hello", "Hello, how are you?"])
        answer = pick(rng, ["Hello! How can I help you today?", "Hi! What can I do for you?", "Hello there!"])
        return user, ["The user greets me.", "I should greet them back.", "A short friendly reply is enough."], answer
    if kind == 1:
        name = pick(rng, words.NAMES)
        user = pick(rng, ["Say hello to {n}.", "Greet {n} for me.", "Please say hi to {n}.", "Welcome {n}."])
        answer = pick(rng, ["Hello, {n}! Nice to meet you.", "Hi {n}, welcome!", "Hello {n}!"])
        return (
            user.format(n=name),
            [f"The user wants me to greet {name}.", "I will say hello.", "Keep it short."],
            (answer.format(n=name)),
        )
    if kind == 2:
        a = pick(rng, words.ANIMALS)
        user = pick(
            rng, ["Tell me about the {a}.", "What is a {a}?", "Give me a fun fact about the {a}.", "Describe a {a}."]
        )
        answer = pick(
            rng,
            [
                "The {a} is an animal that many people find interesting.",
                "A {a} is an animal. I know only a little about the {a}.",
            ],
        )
        return (
            user.format(a=a),
            [f"The user asks about the {a}.", "I have no tool for this.", "A short answer will do."],
            (answer.format(a=a)),
        )
    if kind == 3:
        phrase = f"the {pick(rng, words.ADJECTIVES)} {pick(rng, words.ANIMALS)} likes the {pick(rng, words.NOUNS)}"
        user = pick(rng, ["Repeat after me: {p}", "Say this back to me: {p}", "Echo this: {p}", "Please repeat: {p}"])
        return (
            user.format(p=phrase),
            ["The user wants me to repeat a phrase.", "I will repeat it exactly.", "Nothing else."],
            (cap(phrase) + "."),
        )
    if kind == 4:
        topic = pick(rng, words.TOPICS)
        adj = pick(rng, words.ADJECTIVES)
        user = pick(rng, ["Write a short poem about {t}.", "Write two lines about {t}.", "A tiny poem on {t}, please."])
        answer = f"{cap(topic)}, so {adj} and near,\n{topic} stays with me all year."
        return (
            user.format(t=topic),
            [f"The user wants a short poem about {topic}.", "Two lines are enough.", ("I will keep it simple.")],
            answer,
        )
    if kind == 5:
        verb, noun = pick(rng, words.VERBS), pick(rng, words.NOUNS)
        user = pick(
            rng,
            [
                "Can you help me {v} my {n}?",
                "How do I {v} my {n}?",
                "Any tips to {v} the {n}?",
                "I need to {v} my {n}.",
            ],
        )
        answer = f"Sure. To {verb} your {noun}, make a short list and take one step at a time."
        return (
            user.format(v=verb, n=noun),
            [f"The user wants help to {verb} the {noun}.", "Give simple advice.", ("No tool is needed.")],
            answer,
        )
    if kind == 6:
        c = pick(rng, words.COLORS)
        user = pick(
            rng, ["What do you think of the color {c}?", "Is {c} a nice color?", "Tell me about the color {c}."]
        )
        return (
            user.format(c=c),
            [f"The user asks about the color {c}.", "Answer kindly.", "One sentence."],
            (f"{cap(c)} is a lovely color."),
        )
    if kind == 7:
        n = int(rng.integers(2, 11))
        user = pick(rng, ["Count from 1 to {n}.", "Count to {n}.", "Please count up to {n}."]).format(n=n)
        return (
            user,
            [f"The user wants me to count to {n}.", "I will list the numbers.", "Then stop."],
            (", ".join(str(i) for i in range(1, n + 1)) + "."),
        )
    if kind == 8:
        user = pick(rng, ["Thanks!", "Thank you", "Thanks a lot.", "Great, thank you!", "Bye", "Goodbye!"])
        answer = "Goodbye! Have a nice day." if user.startswith(("Bye", "Good")) else "You're welcome!"
        return user, ["The user is polite.", "I reply briefly.", "Nothing else is needed."], answer
    if kind == 9:
        user = pick(
            rng,
            [
                "What can you do?",
                "Who are you?",
                "What are you?",
                "Help",
                "Tell me a joke.",
                "What is the meaning of life?",
            ],
        )
        answer = "I am a small built-in assistant. I can answer simple requests and call the tools I am given."
        return user, ["The user asks what I can do.", "I am a small model.", "Say so briefly."], answer
    pool = words.NOUNS + words.ANIMALS + words.ADJECTIVES + words.VERBS + words.COLORS
    n = int(rng.integers(1, 6))
    user = " ".join(pick(rng, pool) for _ in range(n)) + pick(rng, ["", "?", ".", "!"])
    answer = pick(
        rng, ["I am not sure what you mean. Could you say more?", "Could you tell me a bit more about what you need?"]
    )
    return cap(user), ["The request is unclear.", "I should ask for details.", "Keep it short."], answer
