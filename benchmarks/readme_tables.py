"""The README's generated tables: each benchmark writes its own between a pair of HTML comments,
so a rerun replaces the table and leaves the prose around it alone. (Imported as `readme_tables`
by the scripts beside it: running one puts this folder first on sys.path.)"""


def with_table(text: str, begin: str, end: str, table: str) -> str:
    """`text` with `table` in place of whatever stood between the `begin` and `end` lines."""
    if begin not in text or end not in text or text.index(begin) > text.index(end):
        raise ValueError(f"no {begin} ... {end} lines to write the table between: add them")
    before, rest = text.split(begin, 1)
    return f"{before}{begin}\n{table}\n{end}{rest.split(end, 1)[1]}"
