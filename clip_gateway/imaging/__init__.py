"""Image bytes to model input: JPEG walking and scaled decoding, preprocessing, orientation."""
