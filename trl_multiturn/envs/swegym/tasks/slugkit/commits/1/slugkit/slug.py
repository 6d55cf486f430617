"""URL slugs from arbitrary titles."""

import re
import unicodedata


def slugify(text, sep="-", max_length=None):
    """Lower-case ASCII words of `text` joined by `sep`, at most `max_length` characters long.

    The result never starts or ends with `sep` and never holds two separators in a row.
    """
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]+", sep, ascii_text.lower()).strip(sep)
    if max_length is not None:
        slug = slug[:max_length]
    return slug
