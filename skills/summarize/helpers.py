# Summarizing helpers for code mode (see SKILL.md). Plain functions only: this runs in Monty.


def _cut(text, start, end):
    """The best place to end a chunk in text[start:end]: a paragraph, line, sentence or word end."""
    if end >= len(text):
        return len(text)
    floor = start + (end - start) * 3 // 5  # never cut in the first 60% of a chunk
    for mark in ["\n\n", "\n", ". ", "? ", "! ", "; ", " "]:
        at = text.rfind(mark, floor, end)
        if at >= 0:
            return at + len(mark)
    return end


def chunk_text(text, size=8000, overlap=200):
    """Split text into chunks of at most `size` characters, overlapping by about `overlap`."""
    if size <= 0 or overlap < 0 or overlap >= size // 2:
        raise ValueError("need size > 0 and 0 <= overlap < size / 2")
    chunks = []
    start = 0
    while start < len(text):
        end = _cut(text, start, start + size)
        chunks.append(text[start:end])
        if end >= len(text):
            break
        nxt = end - overlap
        if overlap:  # start the overlap at a word boundary when there is one
            space = text.find(" ", nxt, end)
            if space >= 0:
                nxt = space + 1
        start = max(nxt, start + 1)
    return chunks


def summarize_text(text, instructions="", size=8000, max_chunks=12):
    """Summarize text of any length with llm_query: one call if short, else map-reduce."""
    goal = instructions or "A concise summary that keeps key facts, numbers, names and dates."
    if len(text) <= size:
        return llm_query("Summarize the text below. " + goal + "\n\n<text>\n" + text + "\n</text>")
    parts = chunk_text(text, size, 200)
    if len(parts) > max_chunks:
        raise ValueError("text is " + str(len(text)) + " characters, " + str(len(parts))
                         + " chunks; over max_chunks=" + str(max_chunks) + " (raise it, or summarize a part)")
    notes = []
    for i, part in enumerate(parts):
        notes.append(llm_query("This is part " + str(i + 1) + " of " + str(len(parts)) + " of a longer text. "
                               + "Write dense notes of everything in it that matters for this goal: " + goal
                               + "\n\n<part>\n" + part + "\n</part>"))
    joined = "\n\n".join(["Part " + str(i + 1) + ":\n" + n for i, n in enumerate(notes)])
    while len(joined) > size * 2 and len(notes) > 1:  # notes still too long: merge them pairwise
        merged = []
        for i in range(0, len(notes), 2):
            merged.append(llm_query("Merge these notes into one set of dense notes, dropping repeats:\n\n"
                                    + "\n\n".join(notes[i:i + 2])))
        notes = merged
        joined = "\n\n".join(notes)
    return llm_query("Below are notes on consecutive parts of one text. Write the final answer. " + goal
                     + "\n\n" + joined)
