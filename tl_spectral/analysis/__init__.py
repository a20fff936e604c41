"""Pure tensor maths of the analyses (torch / numpy / scipy / pywt only)."""
