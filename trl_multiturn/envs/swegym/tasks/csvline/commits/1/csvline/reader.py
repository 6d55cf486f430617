"""Split and join one line of comma-separated values, with RFC 4180 quoting."""


def split_line(line, delimiter=","):
    fields, current, in_quotes = [], [], False
    i = 0
    while i < len(line):
        ch = line[i]
        if in_quotes:
            if ch == '"':
                in_quotes = False
            else:
                current.append(ch)
        elif ch == '"':
            in_quotes = True
        elif ch == delimiter:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    if in_quotes:
        raise ValueError(f"unterminated quoted field in {line!r}")
    fields.append("".join(current))
    return fields


def join_line(fields, delimiter=","):
    out = []
    for field in fields:
        text = str(field)
        if delimiter in text or '"' in text or "\n" in text:
            text = '"' + text.replace('"', '""') + '"'
        out.append(text)
    return delimiter.join(out)
