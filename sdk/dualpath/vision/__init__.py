"""Images for vision models: bytes to pixels (``decode``), pixels to the squares a projector
file's encoder reads (``preprocess``)."""
