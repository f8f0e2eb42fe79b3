"""The real-document corpus: Debian manuals printed and labelled into litdata shards (docs/corpus.md)."""
