package redfish

import (
	"testing"

	"go.uber.org/goleak"
)

// Clients of closed test servers must not leave connections reading.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
