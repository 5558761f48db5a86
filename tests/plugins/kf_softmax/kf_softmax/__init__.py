"""Row softmax forward for the PTX Kernel Factory, shipped as a third-party problem plugin to prove that a new
problem needs no change to the factory itself."""
