import { ServerConnection } from '@jupyterlab/services';

import { MAX_INTERVAL_S, MemoryModel } from '../model';
import { requestAPI } from '../request';

jest.mock('../request', () => ({ requestAPI: jest.fn() }));

const request = requestAPI as jest.MockedFunction<typeof requestAPI>;
const settings = {} as ServerConnection.ISettings;

function answer(interval: number, time = 0): Promise<any> {
  return Promise.resolve({ interval, time, kernels: [] });
}

function setHidden(hidden: boolean): void {
  Object.defineProperty(document, 'hidden', { configurable: true, get: () => hidden });
  Object.defineProperty(document, 'visibilityState', {
    configurable: true,
    get: () => (hidden ? 'hidden' : 'visible')
  });
  document.dispatchEvent(new Event('visibilitychange'));
}

describe('MemoryModel', () => {
  beforeEach(() => {
    jest.useFakeTimers();
    request.mockReset();
    setHidden(false);
  });
  afterEach(() => {
    jest.useRealTimers();
  });

  it('has one request out at a time: a refresh meanwhile waits for it', async () => {
    let release: (v: any) => void = () => undefined;
    request.mockImplementationOnce(() => new Promise(r => (release = r)));
    request.mockImplementation(() => answer(2, 2));
    const m = new MemoryModel(settings);
    const first = m.refresh();
    await jest.advanceTimersByTimeAsync(0);
    const second = m.refresh(); // joins the reading that is out
    m.start(); // a no-op while it is out
    await jest.advanceTimersByTimeAsync(0);
    expect(request).toHaveBeenCalledTimes(1);
    release({ interval: 2, time: 1, kernels: [] });
    await first;
    await second;
    expect(m.reading?.time).toEqual(1);
    await jest.advanceTimersByTimeAsync(2000); // then at the server's interval
    expect(request).toHaveBeenCalledTimes(2);
    expect(m.reading?.time).toEqual(2);
    m.dispose();
  });

  it('polls at the interval the server asks for, never faster than half a second, and stops when disposed', async () => {
    request.mockImplementation(() => answer(0));
    const m = new MemoryModel(settings);
    m.start();
    await jest.advanceTimersByTimeAsync(0);
    expect(request).toHaveBeenCalledTimes(1);
    await jest.advanceTimersByTimeAsync(499);
    expect(request).toHaveBeenCalledTimes(1);
    await jest.advanceTimersByTimeAsync(2);
    expect(request).toHaveBeenCalledTimes(2);
    m.dispose();
    await jest.advanceTimersByTimeAsync(5000);
    expect(request).toHaveBeenCalledTimes(2);
  });

  it('keeps the last reading, says why the server did not answer, and backs off', async () => {
    request.mockImplementationOnce(() => answer(2));
    request.mockImplementation(() => Promise.reject(new Error('503')));
    const m = new MemoryModel(settings);
    m.start();
    await jest.advanceTimersByTimeAsync(0);
    await jest.advanceTimersByTimeAsync(2000);
    expect(m.error).toContain('did not answer');
    expect(m.reading?.interval).toEqual(2);
    const failed = request.mock.calls.length;
    await jest.advanceTimersByTimeAsync(2000); // at the old pace it would have tried again
    expect(request.mock.calls.length).toEqual(failed);
    await jest.advanceTimersByTimeAsync(MAX_INTERVAL_S * 1000);
    expect(request.mock.calls.length).toBeGreaterThan(failed); // it tries again, later
    m.dispose();
  });

  it('stands by while the page is hidden, and reads when it shows again', async () => {
    request.mockImplementation(() => answer(1));
    const m = new MemoryModel(settings);
    m.start();
    await jest.advanceTimersByTimeAsync(0);
    expect(request).toHaveBeenCalledTimes(1);
    setHidden(true);
    await jest.advanceTimersByTimeAsync(10000);
    const whileHidden = request.mock.calls.length;
    await jest.advanceTimersByTimeAsync(10000);
    expect(request.mock.calls.length).toEqual(whileHidden); // no reading while hidden
    setHidden(false); // the page shows again: it reads at once
    await jest.advanceTimersByTimeAsync(0);
    expect(request.mock.calls.length).toEqual(whileHidden + 1);
    m.dispose();
  });
});
