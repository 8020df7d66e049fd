"""The recommendation service. It never imports torch, so its image stays small."""
