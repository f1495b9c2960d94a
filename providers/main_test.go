package providers_test

import (
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }
