"""Plain-terminal questions for ``accel config``: a prompt, a default in brackets, Enter keeps it.

Reads with ``input()``, so it works in any terminal and with answers piped on stdin. When stdin
ends before the last question, ``InputEndedError`` says so: a config half answered by chance
(a closed terminal, a pipe shorter than the questions) must not be written.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from accel_core.environment import parse_flag

T = TypeVar("T")


class InputEndedError(ValueError):
    """Standard input ended before every question was answered."""

    def __init__(self, question: str, answered: int) -> None:
        super().__init__(
            f"standard input ended at the question {question!r}, after {answered} answer(s): nothing was written. "
            "Answer every question (Enter keeps the [default]), or run `accel config default`, which asks none."
        )


class Asker:
    """Asks questions on stdout, reads answers from stdin; raises ``InputEndedError`` when stdin ends."""

    def __init__(self, read: Callable[[str], str] = input, write: Callable[[str], Any] = print) -> None:
        self._read = read
        self._write = write
        self.answered = 0

    def _answer(self, question: str, prompt: str) -> str:
        try:
            answer = self._read(prompt).strip()
        except EOFError:
            self._write("")
            raise InputEndedError(question, self.answered) from None
        self.answered += 1
        if self._read is input and not sys.stdin.isatty():
            self._write(answer)  # piped answers are not echoed by a terminal: keep the transcript readable
        return answer

    def ask(self, question: str, default: T, parse: Callable[[str], T], hint: str = "", required: bool = True) -> T:
        """Asks until the answer parses; an empty answer keeps ``default`` (which may be None only when
        the question is not ``required``)."""
        fallback = default  # returned as given (the checks below narrow `default`)
        shown = "" if default is None else ("yes" if default is True else "no" if default is False else str(default))
        prompt = f"{question}{f' ({hint})' if hint else ''}{f' [{shown}]' if shown else ''}: "
        for _ in range(5):
            answer = self._answer(question, prompt)
            if not answer:
                if default is not None or not required:
                    return fallback
                self._write("  an answer is needed")
                continue
            try:
                return parse(answer)
            except ValueError as error:
                self._write(f"  {error}")
        raise ValueError(f"No valid answer to {question!r}; run `accel config` again.")

    def yes_no(self, question: str, default: bool) -> bool:
        return self.ask(question, default, parse_flag, "yes/no")

    def integer(self, question: str, default: int, minimum: int = 0) -> int:
        def parse(text: str) -> int:
            try:
                value = int(text)
            except ValueError:
                raise ValueError(f"please answer with a whole number, e.g. {default}") from None
            if value < minimum:
                raise ValueError(f"please answer with a number of at least {minimum}")
            return value

        return self.ask(question, default, parse)

    def choice(self, question: str, default: str, choices: Sequence[str]) -> str:
        def parse(text: str) -> str:
            if text.lower() in choices:
                return text.lower()
            raise ValueError(f"please answer one of: {', '.join(choices)}")

        return self.ask(question, default, parse, ", ".join(choices))

    def text(self, question: str, default: str | None) -> str | None:
        return self.ask(question, default, str)
