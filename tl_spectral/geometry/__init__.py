"""Weight geometry of attention heads (routing / filtering, rotary, S–D, cascades)."""
