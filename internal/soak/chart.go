package soak

import (
	"fmt"
	"io"
	"sort"
	"time"
)

// WriteSVG draws the run's timeline: one row per fault kind with its
// windows (a partition's, a link fault's and a clock step's say in their
// title whom and how much), a row of the unscheduled events (elections and
// seals no fault caused) when there were any, a row of failed reads, the unavailable windows (failed reads
// with a valid credential cached, which a kill or restart explains), the
// AWS client's failed calls, the nodes' active spans, and the plugin's RSS as a line.
func WriteSVG(w io.Writer, ops []Op, r *Report) {
	const width, left, rowH, rssH = 1000.0, 150.0, 18.0, 120.0
	span := r.End.Sub(r.Start).Seconds()
	if span <= 0 {
		span = 1
	}
	x := func(t time.Time) float64 { return left + (width-left-10)*t.Sub(r.Start).Seconds()/span }
	var kinds []string
	for k := range r.FaultsByKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var nodes []string
	seen := map[string]bool{}
	for _, a := range r.Active {
		if !seen[a.Node] {
			seen[a.Node] = true
			nodes = append(nodes, a.Node)
		}
	}
	sort.Strings(nodes)
	rows := kinds
	if len(r.Events) > 0 {
		rows = append(rows, "unscheduled events")
	}
	rows = append(rows, "failed reads", "unavailable", "AWS client failed")
	for _, n := range nodes {
		rows = append(rows, n+" active")
	}
	height := float64(len(rows))*rowH + rssH + 50
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(w, `<text x="4" y="12">chaos soak %s .. %s (%s)</text>`+"\n", r.Start.Format(time.RFC3339), r.End.Format("15:04:05"), r.End.Sub(r.Start).Round(time.Second))
	row := map[string]float64{}
	for i, name := range rows {
		y := 20 + float64(i)*rowH
		row[name] = y
		fmt.Fprintf(w, `<text x="4" y="%.1f">%s</text><line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", y+12, name, left, width-10, y+rowH, y+rowH)
	}
	for _, o := range ops {
		switch {
		case o.Kind == KindFault:
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="#e69f00"><title>%s</title></rect>`+"\n", x(o.Invoke), row[o.Fault]+3, max(1, x(o.Return)-x(o.Invoke)), rowH-6, faultTitle(o))
		case o.Kind == KindRead && !o.OK:
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="1" height="%.0f" fill="#999"/>`+"\n", x(o.Invoke), row["failed reads"]+3, rowH-6)
		case o.Kind == KindAWSClient && !o.OK:
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="2" height="%.0f" fill="#999"/>`+"\n", x(o.Invoke), row["AWS client failed"]+3, rowH-6)
		}
	}
	for _, e := range r.Events {
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="#cc79a7"><title>%s</title></rect>`+"\n", x(e.Start), row["unscheduled events"]+3, max(1, x(e.End)-x(e.Start)), rowH-6, e)
	}
	for _, u := range r.Unavailable {
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="#d55e00"><title>%s %s</title></rect>`+"\n", x(u.Start), row["unavailable"]+3, max(1, x(u.End)-x(u.Start)), rowH-6, u.Fault, u.End.Sub(u.Start).Round(time.Millisecond))
	}
	for _, a := range r.Active {
		end := a.End
		if end.IsZero() {
			end = r.End
		}
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="#009e73"/>`+"\n", x(a.Start), row[a.Node+" active"]+3, max(1, x(end)-x(a.Start)), rowH-6)
	}
	top := 20 + float64(len(rows))*rowH + 20
	fmt.Fprintf(w, `<text x="4" y="%.1f">plugin RSS (max %.1f MiB)</text>`+"\n", top+12, r.RSSMax/(1<<20))
	fmt.Fprintf(w, `<polyline fill="none" stroke="#0072b2" points="`)
	for _, o := range ops {
		if o.Kind == KindSample && r.RSSMax > 0 {
			fmt.Fprintf(w, "%.1f,%.1f ", x(o.Invoke), top+rssH-rssH*o.Value/r.RSSMax)
		}
	}
	fmt.Fprintf(w, `"/>`+"\n</svg>\n")
}

// faultTitle is a fault's tooltip: its kind, how, and whom.
func faultTitle(o Op) string {
	t := o.Fault
	if o.Detail != "" {
		t += " " + o.Detail
	}
	if o.Node != "" {
		t += " " + o.Node
	}
	if len(o.Nodes) > 0 {
		t += fmt.Sprintf(" cut off %v", o.Nodes)
	}
	if o.ClockOffset != 0 {
		t += " " + signed(o.ClockOffset)
	}
	return t
}
