"""Data: readers (CoNLL-U, coreference, raw text, parsing), synthetic tokens and word alignment."""
