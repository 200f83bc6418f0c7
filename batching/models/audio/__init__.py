"""The audio family: the audio tasks."""
