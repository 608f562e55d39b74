"""Label value that no loss counts; the data layer writes it, losses skip it."""

IGNORE_INDEX = -100
