import { ServerConnection } from '@jupyterlab/services';

import { MemoryModel } from '../model';
import { requestAPI } from '../request';

jest.mock('../request', () => ({ requestAPI: jest.fn() }));

const request = requestAPI as jest.MockedFunction<typeof requestAPI>;
const settings = {} as ServerConnection.ISettings;

function answer(interval: number): Promise<any> {
  return Promise.resolve({ interval, kernels: [] });
}

describe('MemoryModel', () => {
  beforeEach(() => {
    jest.useFakeTimers();
    request.mockReset();
  });
  afterEach(() => {
    jest.useRealTimers();
  });

  it('never has two requests in flight', async () => {
    let release: (v: any) => void = () => undefined;
    request.mockImplementation(() => new Promise(r => (release = r)));
    const m = new MemoryModel(settings);
    const first = m.refresh();
    const second = m.refresh(); // joins the first
    m.start(); // a no-op while one is in flight
    expect(request).toHaveBeenCalledTimes(1);
    release({ interval: 2, kernels: [] });
    await first;
    await second;
    expect(m.reading?.interval).toEqual(2);
    m.dispose();
  });

  it('polls at the interval, never faster than half a second, and stops when disposed', async () => {
    request.mockImplementation(() => answer(0));
    const m = new MemoryModel(settings);
    await m.refresh();
    expect(request).toHaveBeenCalledTimes(1);
    await jest.advanceTimersByTimeAsync(499);
    expect(request).toHaveBeenCalledTimes(1);
    await jest.advanceTimersByTimeAsync(2);
    expect(request).toHaveBeenCalledTimes(2);
    m.dispose();
    await jest.advanceTimersByTimeAsync(5000);
    expect(request).toHaveBeenCalledTimes(2);
  });

  it('keeps the last reading and says why when the server does not answer', async () => {
    request.mockImplementationOnce(() => answer(2));
    request.mockImplementationOnce(() => Promise.reject(new Error('503')));
    const m = new MemoryModel(settings);
    await m.refresh();
    await jest.advanceTimersByTimeAsync(2000);
    expect(m.error).toContain('did not answer');
    expect(m.reading?.interval).toEqual(2);
    m.dispose();
  });
});
