"""Models for `draftboard demo`: a byte tokenizer, a tiny hybrid target and a DFlash trainer."""
