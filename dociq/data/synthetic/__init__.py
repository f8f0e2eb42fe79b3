"""The synthetic page generator: content, layout, fonts, rendering and questions
(`generator.SyntheticDocuments` is the data set)."""
