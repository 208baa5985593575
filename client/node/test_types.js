// Type-checks index.d.ts and a typed use of the package (types_usage.ts) with TypeScript's
// compiler: tsc --noEmit --strict, the grpc-js and Node.js types from client/node/node_modules.
// The compiler: GRADSERVE_TSC (a path to tsc), else deploy/k8s/validate's TypeScript
// (npm ci --prefix deploy/k8s/validate), else tsc on the PATH. Exits 0 when the types check,
// 1 when they do not (tsc's errors printed), 77 without TypeScript or the npm packages.

'use strict';

const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');
const { SKIP } = require('./server_fixture.js');

const TIMEOUT_MS = 100000;
const REPO = path.resolve(__dirname, '..', '..');

function skip(why) {
  console.log(`SKIP: ${why}`);
  process.exit(SKIP);
}

// [command, leading arguments] of the TypeScript compiler, or null.
function findTsc() {
  if (process.env.GRADSERVE_TSC) return [process.env.GRADSERVE_TSC, []];
  const bundled = path.join(REPO, 'deploy', 'k8s', 'validate', 'node_modules', 'typescript', 'bin', 'tsc');
  if (fs.existsSync(bundled)) return [process.execPath, [bundled]];
  const onPath = spawnSync('tsc', ['--version'], { encoding: 'utf8' });
  return onPath.status === 0 ? ['tsc', []] : null;
}

function main() {
  for (const dir of ['@grpc/grpc-js', '@types/node']) {
    if (!fs.existsSync(path.join(__dirname, 'node_modules', dir))) {
      skip(`client/node/node_modules/${dir} is missing; run \`npm ci --prefix client/node\``);
    }
  }
  const tsc = findTsc();
  if (!tsc) skip('TypeScript not found; run `npm ci --prefix deploy/k8s/validate` or set GRADSERVE_TSC');
  const [command, lead] = tsc;
  const args = [...lead, '--noEmit', '--strict', '--target', 'es2020', '--module', 'commonjs',
    '--moduleResolution', 'node', '--types', 'node', '--typeRoots', path.join(__dirname, 'node_modules', '@types'),
    path.join(__dirname, 'index.d.ts'), path.join(__dirname, 'types_usage.ts')];
  const run = spawnSync(command, args, { cwd: __dirname, encoding: 'utf8', timeout: TIMEOUT_MS });
  if (run.error) throw new Error(`${command} cannot be run: ${run.error.message}`);
  if (run.status !== 0) {
    process.stdout.write(run.stdout);
    process.stderr.write(run.stderr);
    console.error(`FAIL: ${command} ${args.join(' ')} exited ${run.status ?? run.signal}`);
    process.exit(1);
  }
  console.log('node types: index.d.ts and types_usage.ts check with tsc --strict');
}

main();
