package static

import "errors"

// ErrNotInInventory is wrapped by the errors of actions on a machine that
// the BMDB has but the loaded inventory no longer lists.
var ErrNotInInventory = errors.New("machine not in the inventory")
