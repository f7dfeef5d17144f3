// Placeholder: filled in by issue #17's work on runner.
