package bmdb

import (
	"fmt"
	"regexp"
)

// Process names one control loop in the BMDB. Names are stored as text, so a
// new process needs no schema change; they are checked here (and by a format
// constraint in the schema) so that a typo cannot create a process nobody runs.
type Process struct {
	// Name is what the BMDB records in leases, backoffs and history, for
	// example "ShepherdAgentStart".
	Name string
	// ExclusionGroup names a set of processes that must never hold leases on
	// the same machine at the same time. Processes with the same group exclude
	// each other; an empty group means the process only excludes itself.
	ExclusionGroup string
}

var processNameRE = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,62}$`)

// Validate reports whether the process can be stored in the BMDB.
func (p Process) Validate() error {
	if !processNameRE.MatchString(p.Name) {
		return fmt.Errorf("invalid process name %q: want an upper-case letter followed by up to 62 letters or digits", p.Name)
	}
	if p.ExclusionGroup != "" && !processNameRE.MatchString(p.ExclusionGroup) {
		return fmt.Errorf("process %s: invalid exclusion group %q: want an upper-case letter followed by up to 62 letters or digits", p.Name, p.ExclusionGroup)
	}
	return nil
}

// group is the exclusion group stored with the process's leases.
func (p Process) group() string {
	if p.ExclusionGroup == "" {
		return p.Name
	}
	return p.ExclusionGroup
}

func (p Process) String() string { return p.Name }
