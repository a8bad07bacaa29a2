"""Images for vision models: what a picture becomes before a projector file's encoder reads
it (``preprocess``)."""
