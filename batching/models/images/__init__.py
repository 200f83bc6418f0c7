"""The images family: image classification and CLIP."""
