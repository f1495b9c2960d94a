package shepherdcli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// withRecordedCondition makes p evaluate eligibility as the running daemons
// do: this binary's condition of the process with the parameters their
// runners recorded in the BMDB (bmdb.RegisteredCondition), not this
// binary's defaults. It says on errOut which condition it used, and when
// the live replicas disagree. Process flags given on the command line win:
// the operator asked "what if"; the binary's defaults are used when nothing
// is recorded.
//
// The condition's SQL text in the registry is never run: a row changed in
// the database would otherwise run, with the operator's role, whatever it
// says (list every machine, or end other backends). When the recorded text
// is not this binary's, it refuses (ErrConditionDiffers); for a process
// this binary does not know, p keeps no candidates (eligibility unknown)
// and it shows the recorded text, escaped.
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
	case err != nil:
		return p, err
	}
	if p.candidates == nil {
		fmt.Fprintf(c.errOut, "%s: eligibility unknown: this binary does not define %s, and does not run condition SQL read from the BMDB; its condition as recorded by %s at %s, not run: %s\n",
			name, untrusted.Line(p.process.Name, 0), untrusted.Line(rc.By, 0), rc.At.UTC().Format(time.RFC3339), untrusted.Line(rc.SQL, 0))
		return p, nil
	}
	bound, err := rc.Candidates(*p.candidates)
	switch {
	case errors.Is(err, bmdb.ErrConditionDiffers):
		return p, fmt.Errorf(renamed(c.prog, "process %s: %w (recorded by %s at %s); this binary does not run SQL read from the database: run the shepherd release that registered it, `shepherd condition %s` to show both, or give %s's flags to evaluate this binary's condition instead"),
			name, err, untrusted.Line(rc.By, 0), rc.At.UTC().Format(time.RFC3339), name, name)
	case err != nil:
		// Recorded, but with a parameter the registry cannot carry.
		fmt.Fprintf(c.errOut, "%s: %s; eligibility with this binary's defaults\n", name, untrusted.Line(err.Error(), 0))
		return p, nil
	}
	args := bmdb.ArgsText(rc.Args)
	if args == "" {
		args = "no parameters"
	}
	fmt.Fprintf(c.errOut, "%s: eligibility as the daemons evaluate it: condition %s (%s), recorded by %s at %s\n",
		name, bound.Name(), untrusted.Line(args, 0), untrusted.Line(rc.By, 0), rc.At.UTC().Format(time.RFC3339))
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
	p.candidates = &bound
	return p, nil
}

// conditionJSON is the condition command's output in JSON.
type conditionJSON struct {
	Process    string            `json:"process"`
	Binary     *conditionText    `json:"binary,omitempty"`
	Recorded   *conditionText    `json:"recorded,omitempty"`
	Args       map[string]string `json:"recorded_args,omitempty"`
	By         string            `json:"recorded_by,omitempty"`
	At         *time.Time        `json:"recorded_at,omitempty"`
	Same       bool              `json:"same"`
	Difference string            `json:"difference,omitempty"`
}

// conditionText is a condition's text.
type conditionText struct {
	Name string `json:"name"`
	SQL  string `json:"sql"`
	Due  string `json:"due,omitempty"`
}

// condition shows a process's condition as this binary defines it and as
// the BMDB's registry records it, and whether they are the same, without
// running either: what an operator reads when machines refuses eligibility
// because the two differ.
func (c *cli) condition(ctx context.Context, args []string) error {
	p, err := c.process(args[0])
	if err != nil {
		return err
	}
	out := conditionJSON{Process: p.process.Name}
	if p.candidates != nil {
		out.Binary = &conditionText{Name: p.candidates.Name(), SQL: p.candidates.SQL(), Due: p.candidates.Due()}
	}
	rc, err := c.db.RegisteredCondition(ctx, p.process)
	switch {
	case errors.Is(err, bmdb.ErrNotRegistered):
	case err != nil:
		return err
	default:
		out.Recorded = &conditionText{Name: rc.Name, SQL: rc.SQL, Due: rc.Due}
		out.Args, out.By, out.At = rc.Args, rc.By, &rc.At
		if p.candidates != nil {
			_, err := rc.Candidates(*p.candidates)
			out.Same = !errors.Is(err, bmdb.ErrConditionDiffers)
			if !out.Same {
				out.Difference = err.Error()
			}
		}
	}
	if c.json {
		return c.emitJSON(out)
	}
	show := func(label string, t *conditionText) {
		if t == nil {
			return
		}
		fmt.Fprintf(c.out, "%s: %s\n  SQL:\n%s", label, untrusted.Line(t.Name, 0), indented(t.SQL))
		if t.Due != "" {
			fmt.Fprintf(c.out, "  due:\n%s", indented(t.Due))
		}
	}
	show("this binary", out.Binary)
	if out.Recorded != nil {
		show(fmt.Sprintf("recorded in the BMDB by %s at %s", untrusted.Line(out.By, 0), out.At.UTC().Format(time.RFC3339)), out.Recorded)
		fmt.Fprintf(c.out, "  parameters: %s\n", untrusted.Line(bmdb.ArgsText(out.Args), 0))
	}
	switch {
	case out.Binary == nil && out.Recorded == nil:
		fmt.Fprintf(c.out, "%s: neither this binary nor the BMDB's registry defines it\n", untrusted.Line(p.process.Name, 0))
	case out.Binary == nil:
		fmt.Fprintf(c.out, "this binary does not define %s: it does not evaluate the recorded condition\n", untrusted.Line(p.process.Name, 0))
	case out.Recorded == nil:
		fmt.Fprintf(c.out, "not registered in this BMDB: eligibility uses this binary's defaults\n")
	case out.Same:
		fmt.Fprintf(c.out, "same text: eligibility runs this binary's condition with the recorded parameters\n")
	default:
		fmt.Fprintf(c.out, "DIFFERENT (%s): eligibility is refused until the registered condition is this binary's\n", untrusted.Line(out.Difference, 0))
	}
	return nil
}

// indented shows SQL text line by line, each line escaped (a registry row
// may hold terminal escapes), so that a condition reads as it was written.
func indented(sql string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(strings.Trim(sql, "\n"), "\n") {
		b.WriteString("    ")
		b.WriteString(untrusted.Line(line, 0))
		b.WriteByte('\n')
	}
	return b.String()
}
