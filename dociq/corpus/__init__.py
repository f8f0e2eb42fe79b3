"""The real-document corpus builder: Debian manuals fetched, printed to tagged PDF, labelled from
their tag trees or layout, and written as shards (docs/corpus.md).

A layer above `dociq.data` (whose `data/datasets/corpus` holds the shard format and the reader,
`CorpusDocuments`, that training and `dociq eval` use) and below `dociq.cli` (`dociq corpus`); it
imports only `dociq.io` and `dociq.data`, and nothing below it imports it.
"""
