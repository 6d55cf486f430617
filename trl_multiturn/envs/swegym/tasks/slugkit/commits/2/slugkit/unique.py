"""Slugs that do not collide with ones already taken."""

from .slug import slugify


def unique_slug(text, taken, sep="-"):
    base = slugify(text, sep=sep)
    slug, n = base, 2
    while slug in taken:
        slug = f"{base}{sep}{n}"
        n += 1
    return slug
