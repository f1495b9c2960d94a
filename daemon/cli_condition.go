package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// withRecordedCondition makes p evaluate eligibility as the running daemons
// do: with the condition and parameters their runners recorded in the BMDB
// (bmdb.RegisteredCondition), not this binary's defaults. It says on
// errOut which condition it used, and when the live replicas disagree.
// Process flags given on the command line win: the operator asked "what
// if"; the binary's defaults are used when nothing is recorded. A process
// this binary does not know can be evaluated only from the record.
func (c *cli) withRecordedCondition(ctx context.Context, p cliProcess) (cliProcess, error) {
	name := p.label
	if name == "" {
		name = p.process.Name
	}
	if len(c.givenProcessFlags) > 0 && p.candidates != nil {
		fmt.Fprintf(c.errOut, "%s: eligibility with this command's %s, not the condition the daemons recorded\n", name, strings.Join(c.givenProcessFlags, " "))
		return p, nil
	}
	rc, err := c.db.RegisteredCondition(ctx, p.process)
	switch {
	case errors.Is(err, bmdb.ErrNotRegistered):
		if p.candidates != nil {
			fmt.Fprintf(c.errOut, "%s: no daemon has registered it in this BMDB; eligibility with this binary's defaults\n", name)
		}
		return p, nil
	case err != nil && rc.Fingerprint == "":
		return p, err
	case err != nil:
		// Recorded, but with a parameter the registry cannot carry.
		if p.candidates == nil {
			return p, err
		}
		fmt.Fprintf(c.errOut, "%s: %s; eligibility with this binary's defaults\n", name, untrusted.Line(err.Error(), 0))
		return p, nil
	}
	args := bmdb.ArgsText(rc.Args)
	if args == "" {
		args = "no parameters"
	}
	fmt.Fprintf(c.errOut, "%s: eligibility as the daemons evaluate it: condition %s (%s), recorded by %s at %s\n",
		name, rc.Candidates.Name(), untrusted.Line(args, 0), untrusted.Line(rc.By, 0), rc.At.UTC().Format(time.RFC3339))
	if !rc.DueBuilt {
		fmt.Fprintf(c.errOut, "%s: warning: its due rows are not built from this condition (a build is running, or stopped and the next start of the process continues it); until then its claims see only the machines of the chunks built so far and those that writes made due\n", name)
	}
	if rc.Disagree {
		fmt.Fprintf(c.errOut, "%s: warning: the replicas running it disagree on its condition:\n", name)
		for _, r := range rc.Registrants {
			mark := "as recorded"
			if r.Fingerprint != rc.Fingerprint {
				mark = "differs"
			}
			fmt.Fprintf(c.errOut, "  session %s (%s): %s [%s]\n", r.Session, untrusted.Line(r.RuntimeInfo, 0), untrusted.Line(bmdb.ArgsText(r.Args), 0), mark)
		}
	}
	p.candidates = &rc.Candidates
	return p, nil
}
