"""Adapters from public datasets, and question banks (validated cloze / MCQ items) built from them."""
