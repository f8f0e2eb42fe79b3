"""The synthetic page generator: content, layout, fonts, rendering and questions."""
