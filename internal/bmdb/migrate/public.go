package migrate

import bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"

// ExtensionOf is e as the machinery's Extension, which migrates it.
func ExtensionOf(e *bmdbapi.Extension) *Extension { return &Extension{Name: e.Name, FS: e.FS} }

// ExtensionsOf is ExtensionOf of each of exts.
func ExtensionsOf(exts []*bmdbapi.Extension) []*Extension {
	out := make([]*Extension, len(exts))
	for i, e := range exts {
		out[i] = ExtensionOf(e)
	}
	return out
}
