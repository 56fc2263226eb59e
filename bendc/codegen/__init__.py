"""Code generation: kernel plan -> source text. Only this package writes source."""
