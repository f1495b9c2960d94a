package shepherdcli

import (
	"context"
	"fmt"

	"github.com/shepherd-fleet/shepherd/statuspage"
)

// tagJSON is a process's tag in JSON.
type tagJSON struct {
	Process string `json:"process"`
	Name    string `json:"name"`
	Value   string `json:"value"`
}

// tags prints the tags the registered processes keep in their own tables
// about one machine, as their definitions' Tags functions read them: what
// the machine's status page shows below Shepherd's own tags.
func (c *cli) tags(ctx context.Context, args []string) error {
	id, err := c.machine(ctx, args[0])
	if err != nil {
		return err
	}
	if _, err := c.db.Machine(ctx, id, 1); err != nil {
		return err
	}
	var out []tagJSON
	for _, p := range c.knownProcesses() {
		if p.tags == nil {
			continue
		}
		tags, err := statuspage.ReadTags(ctx, c.db.Public(), id, p.tags)
		if err != nil {
			return fmt.Errorf("reading the tags of %s on %s: %w", p.label, id, err)
		}
		for _, t := range tags {
			out = append(out, tagJSON{Process: p.label, Name: t.Name, Value: t.Value})
		}
	}
	if c.json {
		if out == nil {
			out = []tagJSON{}
		}
		return c.emitJSON(out)
	}
	var rows [][]string
	for _, t := range out {
		rows = append(rows, []string{t.Process, t.Name, t.Value})
	}
	return c.table([]string{"PROCESS", "TAG", "VALUE"}, rows)
}
