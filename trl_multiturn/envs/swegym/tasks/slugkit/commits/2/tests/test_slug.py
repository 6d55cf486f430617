from slugkit import slugify, unique_slug


def test_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_unicode_folded_to_ascii():
    assert slugify("Crème brûlée") == "creme-brulee"


def test_runs_of_punctuation_collapse():
    assert slugify("a -- b __ c") == "a-b-c"


def test_custom_separator():
    assert slugify("One Two", sep="_") == "one_two"


def test_unique_slug_counts_up():
    assert unique_slug("News", {"news", "news-2"}) == "news-3"
