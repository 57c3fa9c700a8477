"""The shared nouns: layouts, measured runs, tuning specs, and the one exception tree."""
