"""The prompts of `tokenmill bench speculative`: real text, fixed, so every run asks the same.

Grounded: four tasks whose answers repeat the prompt, each on four sources. Three take prose
passages of the fixed text `bench accuracy` scores (a snapshot of the README): repeat the
passage, fix its typos (the passage with letters swapped in some words), quote its sentences
on a subject. The fourth renames a function in a short piece of Python written for this
benchmark. Prompt i asks task i % 4, so any four consecutive prompts hold every task.

Free: open questions and stories, whose answers owe little to the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEXT = Path(__file__).with_name("accuracy_text.md")
TASKS = ("repeat", "fix-typos", "extract", "rename")
# Passages of TEXT (paragraphs, or items of its lists) by their opening, with the subject the
# extraction task asks about.
PASSAGES = (
    ("tokenmill is a Kubernetes operator", "the engine"),
    ("**Paged KV cache**", "blocks"),
    ("**Prefix cache**", "the prefix"),
    ("**Continuous batching and chunked prefill**", "prefill"),
)

CODE = (
    ("moving_average", "rolling_mean", '''\
def moving_average(values, window):
    """The mean of each run of `window` consecutive values."""
    if window < 1:
        raise ValueError("window must be at least 1")
    total = sum(values[:window])
    averages = [total / window]
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        averages.append(total / window)
    return averages
'''),
    ("count_words", "word_frequencies", '''\
def count_words(text):
    """How often each word occurs in text, ignoring case and punctuation."""
    counts = {}
    for word in text.lower().split():
        word = word.strip(".,;:!?\\"'()")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts
'''),
    ("find_first_at_least", "lower_bound", '''\
def find_first_at_least(sorted_values, target):
    """Index of the first value >= target in a sorted list (its length if none)."""
    low, high = 0, len(sorted_values)
    while low < high:
        middle = (low + high) // 2
        if sorted_values[middle] < target:
            low = middle + 1
        else:
            high = middle
    return low
'''),
    ("parse_duration", "duration_seconds", '''\
def parse_duration(text):
    """Seconds in a duration such as "1h30m" or "45s"."""
    units = {"h": 3600, "m": 60, "s": 1}
    seconds = 0
    number = ""
    for char in text.strip():
        if char.isdigit():
            number += char
        elif char in units and number:
            seconds += int(number) * units[char]
            number = ""
        else:
            raise ValueError(f"not a duration: {text!r}")
    if number:
        raise ValueError(f"a number without a unit in {text!r}")
    return seconds
'''),
)

FREE = (
    "Write a short story about a lighthouse keeper.",
    "What are the main causes of inflation?",
    "Explain how vaccines train the immune system.",
    "Describe a day in the life of a honeybee.",
    "Give advice to someone who is starting to learn the piano.",
    "Write a poem about autumn rain.",
    "Why is the sky blue?",
    "What should I pack for a week-long hiking trip?",
    "Tell me about the history of the bicycle.",
    "How do I make a good cup of tea?",
    "Write a letter to a friend who has moved to another country.",
    "What are the benefits of regular exercise?",
    "Invent a new board game and explain its rules.",
    "Describe what a city might look like in a hundred years.",
    "How do airplanes stay in the air?",
    "Write a conversation between a cat and a dog about the weather.",
)


@dataclass(frozen=True)
class Prompt:
    workload: str   # "grounded" or "free"
    task: str       # one of TASKS, or "free"
    text: str       # the user's message
    source: str = ""  # the text the answer should repeat (grounded only)


def grounded_prompts() -> list[Prompt]:
    prose = passages()
    prompts = []
    for i in range(len(TASKS) * len(PASSAGES)):
        task = TASKS[i % len(TASKS)]
        source = (i + i // len(TASKS)) % len(PASSAGES)  # each task meets every source once
        prompts.append(_grounded(task, source, prose))
    return prompts


def free_prompts() -> list[Prompt]:
    return [Prompt("free", "free", text) for text in FREE]


def passages() -> list[str]:
    """The PASSAGES of TEXT, each on one line (list items lose their marker)."""
    blocks = [block for paragraph in TEXT.read_text().split("\n\n")
              for block in paragraph.split("\n- ")]
    found = []
    for opening, _ in PASSAGES:
        block = next(b for b in blocks if b.removeprefix("- ").startswith(opening))
        found.append(" ".join(block.removeprefix("- ").split()))
    return found


def misspell(text: str) -> str:
    """text with the second and third letters of every fifth word of 5+ letters swapped."""
    words = text.split(" ")
    long_words = 0
    for i, word in enumerate(words):
        if len(word) >= 5 and word.isalpha():
            long_words += 1
            if long_words % 5 == 0 and word[1] != word[2]:
                words[i] = word[0] + word[2] + word[1] + word[3:]
    return " ".join(words)


def _grounded(task: str, source: int, prose: list[str]) -> Prompt:
    passage = prose[source]
    if task == "repeat":
        return Prompt("grounded", task, f"Repeat the following text exactly.\n\n{passage}",
                      passage)
    if task == "fix-typos":
        wrong = misspell(passage)
        return Prompt("grounded", task, "Fix the typos in this paragraph and write the "
                                        f"corrected paragraph:\n\n{wrong}", wrong)
    if task == "extract":
        subject = PASSAGES[source][1]
        return Prompt("grounded", task, f"Quote the sentences of this text that mention "
                                        f"{subject}:\n\n{passage}", passage)
    old, new, code = CODE[source]
    return Prompt("grounded", task, f"Rewrite this code with the function `{old}` renamed to "
                                    f"`{new}`. Show the whole code.\n\n```python\n{code}```",
                  code)
