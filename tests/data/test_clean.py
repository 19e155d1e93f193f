from mt.data.clean import CleanCounts, clean_pairs

HANDMADE = [
    ("ein Hund", "a dog"),  # kept
    ("", "x"),  # empty
    ("   ", "y"),  # empty after stripping
    ("w " * 6, "six words"),  # too long (max_words=5), even though the ratio is fine
    ("a", "abcdefghijk"),  # ratio 11 > 9
    ("a", "abcdefghi"),  # ratio exactly 9: kept
    ("w " * 5, "five"),  # exactly max_words: kept
    ("ein Hund", "a dog"),  # duplicate
    (" ein Hund ", "a dog\t"),  # duplicate once stripped
    ("ein Hund", "a cat"),  # same source, other target: not a duplicate
]


def test_clean_counts_are_exact():
    counts = CleanCounts()
    kept = list(clean_pairs(HANDMADE, counts, max_words=5, max_ratio=9.0, dedup=True))
    assert kept == [("ein Hund", "a dog"), ("a", "abcdefghi"), ("w w w w w", "five"), ("ein Hund", "a cat")]
    assert counts.as_dict() == {
        "read": 10,
        "empty": 2,
        "too_long": 1,
        "ratio": 1,
        "duplicates": 2,
        "too_many_pieces": 0,
        "kept": 4,
    }


def test_without_dedup_duplicates_are_kept():
    counts = CleanCounts()
    kept = list(clean_pairs(HANDMADE, counts, max_words=5, max_ratio=9.0, dedup=False))
    assert len(kept) == counts.kept == 6
    assert counts.duplicates == 0


def test_dedup_compares_whole_pairs():
    pairs = [("ab", "c"), ("a", "bc"), ("ab", "c"), ("c", "ab")]
    counts = CleanCounts()
    assert list(clean_pairs(pairs, counts, dedup=True)) == [("ab", "c"), ("a", "bc"), ("c", "ab")]
    assert counts.duplicates == 1
