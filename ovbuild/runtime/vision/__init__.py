"""Vision towers at serving time: encoding images into the language model's placeholder embeddings."""
