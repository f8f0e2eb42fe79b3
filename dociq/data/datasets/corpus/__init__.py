"""The real-document corpus as training reads it: the litdata shard format (store.py), a stored page
read back as a Page (record.py) and `CorpusDocuments` (dataset.py). The builder is `dociq.corpus`
(docs/corpus.md)."""
