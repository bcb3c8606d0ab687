// Type-checks Grafana dashboard JSON files against Grafana's published schema (@grafana/schema).
//
// Usage: node <compiled check.js> DASHBOARD.json...   (run from this folder)
//
// Each dashboard becomes an in-memory TypeScript module whose object literals must satisfy the
// schema's types: the dashboard itself, every panel (Panel or RowPanel), every panel's options
// and custom field config (the panel plugin's own types), every query, every variable. Object
// literals get excess-property checks, so a misspelt or unknown key fails as surely as a wrong
// type. Exit 0 when every file conforms, 1 with the compiler's messages otherwise.

import * as fs from "node:fs";
import * as path from "node:path";
import ts from "typescript";

const root = process.cwd();

// Panel plugins this checker knows the option types of; another panel type is an error, so a
// new one cannot slip by unchecked.
const PANEL_TYPES: Record<string, string> = {
  timeseries:
    "@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen",
  stat: "@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen",
};

// JSON carries an enum's value, never the enum: map string enums to their literal values.
const PRELUDE = `
import type { Dashboard, DataQuery, Panel, RowPanel, VariableModel } from "@grafana/schema";
${Object.entries(PANEL_TYPES)
  .map(([name, module]) => `import type * as ${name}Panel from "${module}";`)
  .join("\n")}
type Json<T> = T extends string
  ? \`\${T}\`
  : T extends number | boolean | null | undefined
    ? T
    : T extends ReadonlyArray<infer U>
      ? Json<U>[]
      : T extends object
        ? { [K in keyof T]: Json<T[K]> }
        : T;
type Query = DataQuery & Record<string, unknown>;
`;

type JsonObject = Record<string, unknown>;

function literal(value: unknown): string {
  return JSON.stringify(value, null, 2);
}

function panelChecks(
  file: string,
  panel: JsonObject,
  index: number,
  problems: string[],
): string[] {
  const out: string[] = [];
  const name = `panel_${index}`;
  if (panel.type === "row") {
    out.push(`export const ${name} = (${literal(panel)}) satisfies Json<RowPanel>;`);
    return out;
  }
  out.push(`export const ${name} = (${literal(panel)}) satisfies Json<Panel>;`);
  const kind = String(panel.type);
  if (!(kind in PANEL_TYPES)) {
    problems.push(`${file}: panel ${index} (${String(panel.title)}): no schema known for type ${kind}`);
    return out;
  }
  out.push(
    `export const ${name}_options = (${literal(panel.options ?? {})}) satisfies Json<${kind}Panel.Options>;`,
  );
  const fieldConfig = panel.fieldConfig as JsonObject | undefined;
  const defaults = (fieldConfig?.defaults ?? {}) as JsonObject;
  if (kind === "timeseries") {
    out.push(
      `export const ${name}_custom = (${literal(defaults.custom ?? {})}) satisfies Json<timeseriesPanel.FieldConfig>;`,
    );
  }
  out.push(`export const ${name}_targets = (${literal(panel.targets ?? [])}) satisfies Json<Query>[];`);
  return out;
}

function moduleFor(file: string, dashboard: JsonObject, problems: string[]): string {
  // One literal per level: TypeScript reports one problem per literal, so nesting the panels
  // in the dashboard's literal would hide a top-level problem behind a panel's.
  const top = { ...dashboard, panels: [], templating: { list: [] } };
  const lines = [PRELUDE, `export const dashboard = (${literal(top)}) satisfies Json<Dashboard>;`];
  const panels = (dashboard.panels ?? []) as JsonObject[];
  panels.forEach((panel, index) => lines.push(...panelChecks(file, panel, index, problems)));
  const templating = (dashboard.templating ?? {}) as JsonObject;
  const variables = (templating.list ?? []) as JsonObject[];
  variables.forEach((variable, index) =>
    lines.push(`export const variable_${index} = (${literal(variable)}) satisfies Json<VariableModel>;`),
  );
  return lines.join("\n");
}

function check(files: string[]): number {
  const sources = new Map<string, string>();
  const problems: string[] = [];
  files.forEach((file, index) => {
    const dashboard = JSON.parse(fs.readFileSync(file, "utf8")) as JsonObject;
    const virtual = path.join(root, `__dashboard_${index}__.ts`);
    sources.set(virtual, moduleFor(file, dashboard, problems));
  });
  const options: ts.CompilerOptions = {
    strict: true,
    noEmit: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.ESNext,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
    skipLibCheck: true,
    types: [],
  };
  const host = ts.createCompilerHost(options);
  const readFile = host.readFile.bind(host);
  const fileExists = host.fileExists.bind(host);
  const getSourceFile = host.getSourceFile.bind(host);
  host.readFile = (name) => sources.get(name) ?? readFile(name);
  host.fileExists = (name) => sources.has(name) || fileExists(name);
  host.getSourceFile = (name, version, onError, create) => {
    const text = sources.get(name);
    return text === undefined
      ? getSourceFile(name, version, onError, create)
      : ts.createSourceFile(name, text, version, true);
  };
  const program = ts.createProgram([...sources.keys()], options, host);
  const diagnostics = ts.getPreEmitDiagnostics(program);
  const names = new Map([...sources.keys()].map((virtual, index) => [virtual, files[index]]));
  for (const diagnostic of diagnostics) {
    const message = ts.flattenDiagnosticMessageText(diagnostic.messageText, "\n");
    if (diagnostic.file && diagnostic.start !== undefined) {
      const { line } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start);
      const source = names.get(diagnostic.file.fileName) ?? diagnostic.file.fileName;
      const context = diagnostic.file.text.split("\n")[line]?.trim();
      problems.push(`${source}: ${message}\n    at: ${context}`);
    } else {
      problems.push(message);
    }
  }
  for (const problem of problems) {
    console.error(problem);
  }
  console.log(`${files.length} dashboard(s) checked, ${problems.length} problem(s)`);
  return problems.length ? 1 : 0;
}

process.exitCode = check(process.argv.slice(2));
