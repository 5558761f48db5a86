"""Row softmax forward as a third-party problem plugin: proof that a new problem needs no change to the factory."""
