"""SGLang 0.5.23's benchmark package (only the 0.5.23+ simulator wheels carry it, as only 0.5.23 has it)."""
