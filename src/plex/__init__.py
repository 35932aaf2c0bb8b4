"""PLeX: manifests, resolution, policies, artifact composition and the plex CLI."""
