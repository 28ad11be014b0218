"""The learning layer: an executable question bank over the method registry, a terminal
quiz and a static site, in English and Simplified Chinese."""
