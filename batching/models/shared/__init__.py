"""What two or more model families share: the transformers-backed models' torch helpers, the
text models' lengths and counting, and the media decoding the data plane's checks run too."""
