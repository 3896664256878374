"""Files that come with messages: saved beneath the workspace's `inbox/`, their type sniffed
from the content, and what the model gets of them (text, PDF text, images, transcripts)."""
