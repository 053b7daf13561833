"""voltafleet's pure logic: no pyinfra import here, so every piece is unit-tested alone."""
