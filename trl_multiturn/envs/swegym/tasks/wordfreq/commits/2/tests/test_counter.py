from wordfreq import tokenize, top_words, word_counts


def test_tokenize_keeps_apostrophes():
    assert tokenize("don't stop, rock'n roll") == ["don't", "stop", "rock'n", "roll"]


def test_top_words_order():
    assert top_words("b a b c b c", n=2, stopwords=()) == [("b", 3), ("c", 2)]


def test_ties_alphabetical():
    assert top_words("pear fig apple", n=3) == [("apple", 1), ("fig", 1), ("pear", 1)]


def test_stopwords_dropped():
    assert "the" not in word_counts("the cat and the hat")
