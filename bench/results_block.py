"""A generated block of docs/results.md, between its begin and end markers."""


def replace_block(path, begin, end, lines):
    """Writes lines (the block's inside) between begin and end in the file at
    path, replacing what was there; appends the block at the end the first time."""
    new = "\n".join([begin, *lines, end])
    text = open(path).read()
    if begin in text and end in text:
        text = text[:text.index(begin)] + new + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    open(path, "w").write(text)
