package bmdbtest

import (
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// The public kit names the variable its machinery reads: spelled out here
// so that its documentation shows the name, not the machinery's constant.
func TestEnvDSNIsTheMachinerys(t *testing.T) {
	if EnvDSN != bmdbtest.EnvDSN {
		t.Errorf("EnvDSN %q, the machinery reads %q", EnvDSN, bmdbtest.EnvDSN)
	}
}
