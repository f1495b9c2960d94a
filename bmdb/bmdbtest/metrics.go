package bmdbtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/internal/scrape"
)

// Metric sums the counter and gauge series of the family name in g (a
// test's registry) whose labels include labels (name, value pairs), as
// scrape.Families.Sum does for a daemon's /metrics. It fails t when g has
// no such family: a misspelt name must not read as zero.
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	fams := make(scrape.Families, len(mfs))
	for _, mf := range mfs {
		fams[mf.GetName()] = mf
	}
	sum, err := fams.Sum(name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}
