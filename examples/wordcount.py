"""User functions of the word-count example (importable as `wordcount`)."""


def split(line: str) -> list[str]:
    """The lower-cased words of a line of text."""
    return line.lower().split()


def word(record: str) -> str:
    """The key of a word record: the word itself."""
    return record
