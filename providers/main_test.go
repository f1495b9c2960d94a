package providers_test

import (
	"testing"

	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }
