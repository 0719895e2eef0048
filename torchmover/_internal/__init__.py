"""Private plumbing of the hot paths, used by every layer and by nothing outside the package: token
arenas on the device (:mod:`.arena`), host-to-device transfers that do not wait (:mod:`.transfer`),
and the module-tree walks behind the rewards' cache fingerprints and eval mode (:mod:`.moduletree`)."""
